#!/bin/sh
# One-shot init for the compose stack (service "init"); every step is safe to run again.
#  1. SECRET_KEY: the one given in .env, else one generated on first run, kept in the
#     "secrets" volume that web, worker and beat read through SECRET_KEY_FILE.
#  2. Database migrations.
#  3. An admin account, when DJANGO_SUPERUSER_USERNAME and _PASSWORD are set.
#  4. A node token per hostname in AGENT_HOSTNAMES, written to the "agent-tokens" volume that
#     the agent services read (only once: an agent keeps its token across restarts).
set -eu

SECRETS_DIR=/var/lib/gpufleet/secrets
TOKENS_DIR=/var/lib/gpufleet/agent-tokens
umask 077

if [ -n "${SECRET_KEY:-}" ]; then
  printf '%s\n' "$SECRET_KEY" > "$SECRETS_DIR/secret_key"
elif [ ! -s "$SECRETS_DIR/secret_key" ]; then
  python -c 'import secrets; print(secrets.token_urlsafe(64))' > "$SECRETS_DIR/secret_key"
  echo "init: generated SECRET_KEY in the secrets volume"
fi
export SECRET_KEY_FILE="$SECRETS_DIR/secret_key"

python manage.py migrate --noinput

if [ -n "${DJANGO_SUPERUSER_USERNAME:-}" ] && [ -n "${DJANGO_SUPERUSER_PASSWORD:-}" ]; then
  python manage.py createsuperuser --noinput --email "${DJANGO_SUPERUSER_EMAIL:-admin@localhost}" \
    || echo "init: superuser ${DJANGO_SUPERUSER_USERNAME} not created (it probably exists)"
fi

for host in $(echo "${AGENT_HOSTNAMES:-sim-01}" | tr ',' ' '); do
  token_file="$TOKENS_DIR/$host"
  if [ ! -s "$token_file" ]; then
    # issue_node_token prints the token on its last line (docs/deploy.md).
    python manage.py issue_node_token "$host" | tail -n 1 > "$token_file.tmp"
    case "$(cat "$token_file.tmp")" in
      gfn_*) ;;
      *) echo "init: issue_node_token $host printed no token" >&2; rm -f "$token_file.tmp"; exit 1 ;;
    esac
    mv "$token_file.tmp" "$token_file"
    echo "init: issued a node token for $host"
  fi
done
echo "init: done"
