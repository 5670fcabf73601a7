# Billion laughs and a 2 MiB file beside a good declaration: errors for
# those files, the good one applied.
# run: apply => 1 : 1 operations, 1 done
printf 'apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: orders\n' > orders.yaml
{
  echo 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'
  echo 'b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]'
  echo 'c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]'
  echo 'd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]'
  echo 'e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]'
  echo 'f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]'
  echo 'g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]'
} > laughs.yaml
head -c 2097152 /dev/zero | tr '\0' '#' > huge.yaml
