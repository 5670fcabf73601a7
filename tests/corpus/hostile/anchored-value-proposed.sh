# A file whose `owner` carries a YAML anchor an annotation aliases
# (`tend.dev/paused: *v` means the last `&v`, "false"). Rewriting `owner`
# would drop the anchor and pause the declaration with no expiry: propose
# refuses it and says why; the file, merged as it is, plans unpaused.
# run: apply => 0
# run: sandbox edit orders --set owner="alice" => 0
# run: propose orders => 1 : the change touches `&v "false"`, a YAML anchor
# never: Please report
# run: plan => 0 : owner
cat > orders.yaml <<'YAML'
apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
spec:
  comment: &v "true"
  owner: &v "false"
metadata:
  name: orders
  annotations:
    tend.dev/override-reason: INC-1
    tend.dev/paused: *v
YAML
