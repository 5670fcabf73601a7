# One database declared twice, once through the default provider: neither
# is applied.
# run: apply => 1 : database `shared` is also declared by
printf 'apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: a\nspec:\n  databaseName: shared\n' > a.yaml
printf 'apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: b\nspec:\n  provider: sandbox\n  databaseName: shared\n' > b.yaml
