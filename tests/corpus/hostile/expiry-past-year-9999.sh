# An override expiry past year 9999 panicked plan, apply and explain (exit
# 101) after every action was performed.
# run: plan => 1 : override-expires
# run: apply => 1 : override-expires
# run: explain orders => 1 : override-expires
cat > orders.yaml <<'YAML'
apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
metadata:
  name: orders
  annotations:
    tend.dev/paused: "true"
    tend.dev/override-reason: forever
    tend.dev/override-expires: 999999999y
spec:
  connectionLimit: 5
YAML
cat > billing.yaml <<'YAML'
apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
metadata:
  name: billing
  annotations:
    tend.dev/paused: "true"
    tend.dev/override-reason: nearly forever
    tend.dev/override-expires: 8000y
YAML
