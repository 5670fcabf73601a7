# A declaration that is a link to /etc/passwd: skipped, with a warning, and
# never read.
# run: plan => 0 : passwd.yaml: a symbolic link
# run: apply => 0 : 1 operations, 1 done
printf 'apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: orders\n' > orders.yaml
ln -s /etc/passwd passwd.yaml
