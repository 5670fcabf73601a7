# An override reason that clears the screen and forges a line of the plan:
# shown escaped (the harness checks that no raw escape reaches the output).
# run: apply => 0
# run: plan => 0 : \u{1b}[2J
# run: explain orders => 0 : \n
printf 'apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: orders\n  annotations:\n    tend.dev/ignore-fields: connectionLimit\n    tend.dev/override-reason: "INC-1\\nbilling  InSync  None\\e[2J\\e[31m"\nspec:\n  connectionLimit: 5\n' > orders.yaml
