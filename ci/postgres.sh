#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests: `ci/postgres.sh start` installs PostgreSQL from
# Debian's packages when it is missing, runs initdb (as the `postgres` user) into a new temporary
# directory, starts the server on a free loopback port and a private unix socket directory, and prints
# the database URL on its last line (the directory on the line before). `ci/postgres.sh stop DIR`
# stops it and removes the directory; `halt DIR` and `resume DIR` stop and restart it, keeping its data.
# Nothing outside the temporary directory is touched, and no system service is started. The server
# runs with fsync=off (a throwaway for tests); PLANNED_STOP_PG_FSYNC=on makes it durable (benchmarks).
set -euo pipefail

find_bin() {
  for d in /usr/lib/postgresql/*/bin /usr/local/bin /usr/bin; do
    if [ -x "$d/$1" ]; then echo "$d/$1"; return 0; fi
  done
  return 1
}

as_postgres() {
  if [ "$(id -u)" = 0 ]; then
    # runuser keeps no terminal and needs no password; su is the fallback.
    if command -v runuser >/dev/null 2>&1; then runuser -u postgres -- "$@"; else su postgres -s /bin/sh -c "$(printf '%q ' "$@")"; fi
  else
    "$@"
  fi
}

case "${1:-}" in
  start)
    if ! find_bin initdb >/dev/null; then
      echo "installing PostgreSQL from Debian's packages" >&2
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq >&2 && apt-get install -y -qq postgresql >&2
    fi
    initdb=$(find_bin initdb); pg_ctl=$(find_bin pg_ctl)
    if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
      useradd --system --no-create-home postgres
    fi
    dir=$(mktemp -d /tmp/planned-stop-pg.XXXXXX)
    chmod 755 "$dir"
    [ "$(id -u)" = 0 ] && chown postgres "$dir"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    as_postgres "$initdb" -D "$dir/data" -U postgres --auth=trust --no-sync >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; exit 1; }
    mkdir -p "$dir/socket"
    if [ "$(id -u)" = 0 ]; then chown postgres "$dir/socket"; fi
    echo "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir/socket -c fsync=${PLANNED_STOP_PG_FSYNC:-off} -c max_connections=200" >"$dir/options"
    as_postgres "$pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 -o "$(cat "$dir/options")" \
      start >&2 || { cat "$dir/server.log" >&2; exit 1; }
    echo "$dir"
    echo "postgres://postgres@127.0.0.1:$port/postgres"
    ;;
  halt)
    # Stop the server, keeping its data (a database that goes away under a running service).
    dir=${2:?usage: ci/postgres.sh halt DIR}
    as_postgres "$(find_bin pg_ctl)" -D "$dir/data" -m immediate -w stop >&2
    ;;
  resume)
    # Start a halted server again, on the same port.
    dir=${2:?usage: ci/postgres.sh resume DIR}
    as_postgres "$(find_bin pg_ctl)" -D "$dir/data" -l "$dir/server.log" -w -t 60 -o "$(cat "$dir/options")" \
      start >&2 || { cat "$dir/server.log" >&2; exit 1; }
    ;;
  stop)
    dir=${2:?usage: ci/postgres.sh stop DIR}
    pg_ctl=$(find_bin pg_ctl)
    as_postgres "$pg_ctl" -D "$dir/data" -m immediate -w stop >&2 || true
    rm -rf "$dir"
    ;;
  *)
    echo "usage: ci/postgres.sh start | stop DIR | halt DIR | resume DIR" >&2
    exit 2
    ;;
esac
