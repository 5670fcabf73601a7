# A CRLF file with a comment after a `|+` block scalar: the proposal
# keeps the comment on its own line and the file's line endings, and the
# merged result plans in sync.
# run: apply => 0
# run: sandbox edit orders --set comment="new" => 0
# run: propose orders => 0 : +  comment: "new"
# never: Please report
printf 'apiVersion: tend.dev/v1alpha1\r\nkind: ManagedDatabase\r\nmetadata:\r\n  name: orders\r\nspec:\r\n  comment: |+\r\n    first\r\n\r\n  # the owner is the app role\r\n  owner: app\r\n' > orders.yaml
# --- the proposal, merged
# run: plan => 0 : in sync
git apply "$LAST_OUT"
grep -q "^  # the owner is the app role" orders.yaml
test -z "$(awk '!/\r$/' orders.yaml)"
