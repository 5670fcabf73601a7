# Directories nested past the bound: an error for that subtree, the rest
# applied.
# run: plan => 1 : nested more than 32 levels
# run: apply => 1 : 1 operations, 1 done
printf 'apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: orders\n' > orders.yaml
dir=nest
for i in $(seq 1 40); do dir="$dir/d"; done
mkdir -p "$dir"
printf 'apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: deep\n' > "$dir/deep.yaml"
