# `metadata.name` renamed under `deletionPolicy: Delete`, the same
# `databaseName`: the old name's deletion is held (rule `renamed`), the
# new name is blocked and says what would happen and the ways out; the
# database is never deleted and made again empty.
# run: apply => 0 : 1 operations, 1 done
# run: sandbox list => 0 : orders_db
cat > orders.yaml <<'YAML'
apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
metadata:
  name: orders
spec:
  databaseName: orders_db
  deletionPolicy: Delete
YAML
# --- the rename
# run: plan => 0 : its deletion is held while `ledger` names the database
# run: apply => 2 : tend deletions approve orders
# run: explain orders => 0 : ledger
# run: sandbox list => 0 : orders_db
git mv orders.yaml ledger.yaml
sed -i 's/name: orders$/name: ledger/' ledger.yaml
