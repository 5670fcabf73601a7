# Flow collections nested 300,000 deep (600 KB, under the 1 MiB limit)
# beside a good declaration: libyaml's time grows with the square of the
# depth (minutes here), so the file is refused before it is parsed, and
# the good one is applied.
# run: apply => 1 : 1 operations, 1 done
# run: plan => 1 : more than 10000 `[` and `{`
printf 'apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: orders\n' > orders.yaml
{
  printf 'apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: deep\nspec:\n  comment: '
  head -c 300000 /dev/zero | tr '\0' '['
  head -c 300000 /dev/zero | tr '\0' ']'
  echo
} > deep.yaml
