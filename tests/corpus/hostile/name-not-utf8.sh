# A Latin-1 file name: an error for that file (it used to vanish silently).
# run: plan => 1 : caf\xe9.yaml
printf 'apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: orders\n' > orders.yaml
printf 'apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: latin\n' > "$(printf 'caf\351.yaml')"
