# Names and values built to break quoting, paths and terminals: each is a
# located validation error.
# run: plan => 1 : not a lowercase DNS label
cat > names.yaml <<'YAML'
apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
metadata:
  name: "../../etc"
---
apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
metadata:
  name: "x\u001b[31m"
---
apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
metadata:
  name: orders
spec:
  owner: "app\"; DROP DATABASE postgres; --"
  parameters:
    work_mem: "64MB'; DROP"
YAML
