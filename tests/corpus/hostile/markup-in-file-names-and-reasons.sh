# A file name with a newline and `<!--`, another with `<img>`, and an
# override reason carrying a mention, an image, a link and `</details>`:
# none of it reaches a Markdown plan (posted as a PR comment) as markup.
# run: plan --format markdown => 0 : orders
# never: <!--
# never: <img
# never: </details>
# never: ](http
# never: @platform-team
# run: apply => 0
decl() {
  printf 'apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: %s\n' "$1"
}
decl orders > "$(printf 'evil\n<!-- hide.yaml')"
decl carts > 'x<img src=https:__evil.example_p.png>.yaml'
cat > billing.yaml <<'YAML'
apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
metadata:
  name: billing
  annotations:
    tend.dev/ignore-fields: connectionLimit
    tend.dev/override-reason: "@platform-team ![x](http://evil.example/p.png) [docs](http://evil.example) </details>"
spec:
  connectionLimit: 5
YAML
