#!/usr/bin/env bash
# tend next to the tool many teams use today for the same job: Ansible's
# community.postgresql.postgresql_db, over the same N databases (default
# 200) on one throwaway PostgreSQL cluster.
#
#   scripts/compare-ansible.sh            # N=200
#   N=50 scripts/compare-ansible.sh
#
# It installs Ansible (the `ansible` package from PyPI, which ships
# community.postgresql) and psycopg2 in a virtualenv, starts a cluster in a
# temporary directory (as the `postgres` OS user when run as root), and
# times, for each tool, a dry run before anything exists (`tend plan`,
# `ansible-playbook --check`), the run that creates everything (`tend
# apply`, `ansible-playbook`), and both again with nothing to do. Then it
# changes one database of each behind the tools' backs and prints what
# each says about it. The two tools manage disjoint names (tend_NNN,
# ans_NNN) on the same server. Needs a release build of tend
# (`cargo build --release`), python3 with venv, and the PostgreSQL server
# binaries. Figures go to docs/performance.md.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
N=${N:-200}
tend="$root/target/release/tend"
[ -x "$tend" ] || { echo "build tend first: cargo build --release" >&2; exit 1; }
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -n "$bin" ] || { echo "PostgreSQL server binaries missing: apt-get install postgresql" >&2; exit 1; }

work=$(mktemp -d /tmp/tend-vs-ansible.XXXXXX)
chmod 0755 "$work"
as_pg=()
if [ "$(id -u)" = 0 ]; then as_pg=(runuser -u postgres --); fi
cleanup() {
  "${as_pg[@]}" "$bin/pg_ctl" -D "$work/pg" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "== installing Ansible into a virtualenv (PyPI)" >&2
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q ansible psycopg2-binary >&2
export PATH="$work/venv/bin:$PATH" ANSIBLE_NOCOLOR=1 ANSIBLE_LOCALHOST_WARNING=False ANSIBLE_INVENTORY_UNPARSED_WARNING=False

echo "== starting a PostgreSQL cluster" >&2
mkdir -p "$work/pg" "$work/sock"
if [ ${#as_pg[@]} -gt 0 ]; then chown postgres "$work/pg" "$work/sock"; fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"${as_pg[@]}" "$bin/initdb" -D "$work/pg" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 --no-sync >/dev/null
"${as_pg[@]}" "$bin/pg_ctl" -D "$work/pg" -l "$work/sock/log" -w \
  -o "-p $port -k $work/sock -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null

echo "== $N declarations for each tool" >&2
repo="$work/repo"
mkdir -p "$repo/databases"
for i in $(seq -f '%03g' 0 $((N - 1))); do
  printf 'apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: tend-%s\nspec:\n  databaseName: tend_%s\n  connectionLimit: 20\n' "$i" "$i" \
    > "$repo/databases/tend-$i.yaml"
done
git -C "$repo" init -q -b main
git -C "$repo" add .
git -C "$repo" -c user.name=bench -c user.email=bench@example.test commit -q -m declarations
cat > "$work/tend.toml" <<EOF
agent_id = "compare"
state_dir = "$work/state"
[source]
url = "$repo"
path = "databases"
[providers.main]
kind = "postgres"
url = "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
max_concurrency = 8
[status]
branch = ""
EOF
cat > "$work/playbook.yml" <<EOF
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: databases
      community.postgresql.postgresql_db:
        name: "ans_{{ '%03d' | format(item) }}"
        conn_limit: "20"
        login_host: 127.0.0.1
        login_port: $port
        login_user: postgres
      loop: "{{ range(0, $N) | list }}"
EOF

seconds() { # the wall time of a command, in seconds; its output to $work/last
  local start end
  start=$(date +%s.%N)
  "$@" >"$work/last" 2>&1 || { cat "$work/last" >&2; echo "failed: $*" >&2; exit 1; }
  end=$(date +%s.%N)
  python3 -c "print(f'{$end - $start:.2f}')"
}
tend_() { TEND_LOG=error "$tend" --config "$work/tend.toml" "$@"; }
ansible_() { ansible-playbook -i localhost, -e "ansible_python_interpreter=$work/venv/bin/python" "$work/playbook.yml" "$@"; }

declare -A t
t[tend_dry]=$(seconds tend_ plan)
t[ans_dry]=$(seconds ansible_ --check)
t[tend_create]=$(seconds tend_ apply)
t[ans_create]=$(seconds ansible_)
t[tend_noop]=$(seconds tend_ apply)
t[ans_noop]=$(seconds ansible_)
t[tend_noop_dry]=$(seconds tend_ plan)
t[ans_noop_dry]=$(seconds ansible_ --check)

psql_() { psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -Atc "$1"; }
psql_ "ALTER DATABASE tend_007 CONNECTION LIMIT 99; ALTER DATABASE ans_007 CONNECTION LIMIT 99"
tend_ plan >"$work/tend-drift" 2>&1 || true
ansible_ --check --diff >"$work/ans-drift" 2>&1 || true

ratio() { python3 -c "print(f'{$2 / $1:.0f}x')"; }
commit=$(git -C "$root" rev-parse --short=12 HEAD)
echo "tend $commit against Ansible $(ansible --version | head -1 | sed 's/.*\[core /core /; s/\]//'), $N databases each, $(date -u +%Y-%m-%d), $(nproc) cores"
echo
echo "| run | tend | Ansible | Ansible / tend |"
echo "| --- | --- | --- | --- |"
for row in "dry run, nothing exists:dry" "create all:create" "again, nothing to do:noop" "dry run, nothing to do:noop_dry"; do
  name=${row%%:*}; key=${row##*:}
  echo "| $name | ${t[tend_$key]} s | ${t[ans_$key]} s | $(ratio "${t[tend_$key]}" "${t[ans_$key]}") |"
done
echo
echo "One database of each changed behind the tools' backs (CONNECTION LIMIT 20 -> 99):"
echo
echo "tend plan says:"
grep -E '^tend-007|drift connectionLimit|resources:' "$work/tend-drift" | sed 's/^/    /'
echo
echo "ansible-playbook --check --diff says:"
grep -E '^changed: |changed=' "$work/ans-drift" | sed 's/^/    /'
