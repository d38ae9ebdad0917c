#!/usr/bin/env bash
# Builds (and with --check, runs and tests) Fulcrum's container image on a
# machine with buildah but no registry and no container daemon:
#
#   1. a Debian bookworm base made with `debootstrap --variant=minbase` from
#      the mirror this machine's apt uses, cached as a tarball and stored in
#      buildah as localhost/debian:bookworm-local;
#   2. the runtime image, docker/Dockerfile.local (the final stage of
#      docker/Dockerfile, FROM that base) around a release binary, built with
#      `buildah bud --isolation chroot` as localhost/fulcrum:local;
#   3. with --check: a throwaway PostgreSQL 15 on a free loopback port, the
#      image run with `buildah run --isolation chroot` (it shares the host's
#      network) with a config mounted at /etc/fulcrum/fulcrum.toml, and
#      `SELECT 1` through the daemon in it must answer 1.
#
# Usage: docker/build-local.sh [--check] [--refresh-base]
#        docker/build-local.sh --run CONFIG   (the image in the foreground)
#
# Exit status: 0 done; 1 failed; 2 usage; 3 cannot be done on this machine
# (not root, no buildah or debootstrap, no Debian mirror reachable): CI
# reports that and goes on (.ci/run).
#
# Environment (all optional):
#   FULCRUM_IMAGE_CACHE     the debootstrap tarball and build context
#                           (default: target/image-cache in the repository)
#   FULCRUM_DEBIAN_MIRROR   Debian mirror (default: the bookworm URI in
#                           /etc/apt/sources.list*, else deb.debian.org)
#   FULCRUM_BINARY          a fulcrum binary to ship instead of running
#                           `cargo build --release -p fulcrum --locked`
#   FULCRUM_IMAGE           the image's name (default localhost/fulcrum:local)
#   FULCRUM_IMAGE_TIMEOUT   seconds for everything after the cargo build
#                           (default 900); FULCRUM_CARGO_TIMEOUT for the
#                           cargo build (default 3600)
#
# Needs root (debootstrap, and buildah's storage in /var/lib/containers).
# `podman run` is no replacement for step 3 here: crun's setrlimit is refused
# in this sandbox. See docs/deploy.md, "A container image without a registry".
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${FULCRUM_IMAGE_CACHE:-$repo/target/image-cache}
image=${FULCRUM_IMAGE:-localhost/fulcrum:local}
base=localhost/debian:bookworm-local
base_tar=$cache/debian-bookworm-minbase.tar
total_secs=${FULCRUM_IMAGE_TIMEOUT:-900}
cargo_secs=${FULCRUM_CARGO_TIMEOUT:-3600}
# libpq variables that would point psql elsewhere than where it is told.
unset PGHOST PGHOSTADDR PGPORT PGUSER PGDATABASE PGPASSWORD PGPASSFILE PGSERVICE \
  PGSERVICEFILE PGSSLMODE PGOPTIONS PGCONNECT_TIMEOUT PGTARGETSESSIONATTRS

say() { printf 'build-local: %s\n' "$*" >&2; }
die() { say "FAILED: $*"; exit 1; }
cannot() { say "cannot run here: $*"; exit 3; }

mode=build refresh=0 run_config=''
while [ $# -gt 0 ]; do
  case $1 in
    --check) mode=check ;;
    --run) mode=run; run_config=${2:?--run needs a config file}; shift ;;
    --refresh-base) refresh=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) say "unknown argument: $1 (see --help)"; exit 2 ;;
  esac
  shift
done

############################################################ bounds
# Every step runs under `timeout`, bounded by its own limit and by what is
# left of the whole run's (set once the binary is built).
deadline=$((SECONDS + 1000000))
bounded() {
  local secs=$1 left=$((deadline - SECONDS))
  shift
  [ "$left" -gt 0 ] || die "the run's ${total_secs}s are used up (FULCRUM_IMAGE_TIMEOUT) before: $*"
  [ "$secs" -le "$left" ] || secs=$left
  timeout -k 10 "$secs" "$@"
}

############################################################ cleanup
# Whatever this run started, it stops: the daemon (by the pid it got), the
# working container, the PostgreSQL server, the scratch directory.
work='' pg_data='' ctr='' run_pid='' daemon_pid=''
cleanup() {
  local rc=$?
  set +e
  trap - INT TERM
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid" 2>/dev/null
    timeout 10 tail --pid="$daemon_pid" -f /dev/null
  fi
  if [ -n "$run_pid" ] && kill -0 "$run_pid" 2>/dev/null; then
    kill -TERM "$run_pid" 2>/dev/null
    timeout 20 tail --pid="$run_pid" -f /dev/null
    kill -KILL "$run_pid" 2>/dev/null
  fi
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    say "the daemon (pid $daemon_pid) outlived its buildah run: killing it"
    kill -KILL "$daemon_pid" 2>/dev/null
  fi
  [ -z "$ctr" ] || buildah rm "$ctr" >/dev/null
  if [ -n "$pg_data" ] && [ -e "$pg_data/postmaster.pid" ]; then
    (cd / && timeout 60 runuser -u postgres -- "$pg_bin/pg_ctl" -D "$pg_data" -m fast -w stop >/dev/null)
  fi
  [ -z "$work" ] || rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

############################################################ preflight
[ "$(id -u)" -eq 0 ] || cannot "needs root (debootstrap; buildah's storage under /var/lib/containers)"
command -v buildah >/dev/null || cannot "no buildah (apt-get install buildah debootstrap)"
bounded 60 buildah info >/dev/null 2>&1 || cannot "buildah is installed but does not work: $(buildah info 2>&1 | tail -1)"

# The Debian mirror: the first URI apt uses for the suite bookworm (deb822
# .sources paragraphs, then one-line sources.list entries).
debian_mirror() {
  local uri
  uri=$(awk 'BEGIN { RS = "" }
      {
        deb = 0; bookworm = 0; uri = ""
        n = split($0, line, "\n")
        for (i = 1; i <= n; i++) {
          k = line[i]; sub(/:.*/, "", k); v = line[i]; sub(/^[^:]*:[ \t]*/, "", v)
          m = split(v, word, /[ \t]+/)
          for (j = 1; j <= m; j++) {
            if (k == "Types" && word[j] == "deb") deb = 1
            if (k == "Suites" && word[j] == "bookworm") bookworm = 1
            if (k == "URIs" && j == 1) uri = word[j]
          }
        }
        if (deb && bookworm && uri != "") { print uri; exit }
      }' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  if [ -z "$uri" ] && [ -r /etc/apt/sources.list ]; then
    uri=$(awk '$1 == "deb" { sub(/\[[^]]*\] */, ""); if ($3 == "bookworm") { print $2; exit } }' \
      /etc/apt/sources.list)
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}
mirror=${FULCRUM_DEBIAN_MIRROR:-$(debian_mirror)}

# Whether the mirror answers: tells "no network" (exit 3) from a real failure.
mirror_reachable() {
  curl -fsS -m 20 -o /dev/null "${mirror%/}/dists/bookworm/Release" 2>/dev/null
}

############################################################ 1. base
# Unmounts whatever an interrupted debootstrap left mounted under $1 (proc,
# sys), so that removing the directory cannot reach into them.
unmount_under() {
  awk -v d="$1/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r |
    while read -r m; do umount -l "$m"; done
}

make_base_tar() {
  command -v debootstrap >/dev/null || cannot "no debootstrap (apt-get install debootstrap)"
  local root=$cache/rootfs.partial
  mkdir -p "$cache"
  [ ! -e "$root" ] || { unmount_under "$root"; rm -rf "$root"; }
  say "debootstrap --variant=minbase bookworm from $mirror (once; cached in $base_tar)"
  if ! bounded 600 debootstrap --variant=minbase bookworm "$root" "$mirror" >"$cache/debootstrap.log" 2>&1; then
    unmount_under "$root"
    tail -5 "$cache/debootstrap.log" >&2
    mirror_reachable || cannot "the Debian mirror $mirror does not answer (no network?); set FULCRUM_DEBIAN_MIRROR"
    die "debootstrap failed (log: $cache/debootstrap.log)"
  fi
  unmount_under "$root"
  # What bookworm-slim leaves out too: package lists and caches (the image's
  # own RUN fetches fresh lists).
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
  tar -C "$root" --numeric-owner -cf "$base_tar.partial" .
  mv "$base_tar.partial" "$base_tar"
  rm -rf "$root"
}

make_base() {
  if [ "$refresh" -eq 1 ]; then
    rm -f "$base_tar"
    buildah rmi "$base" >/dev/null 2>&1 || true
  fi
  if buildah inspect --type image "$base" >/dev/null 2>&1; then
    say "base $base: present"
    return
  fi
  [ -s "$base_tar" ] || make_base_tar
  # No `buildah import` in Debian's buildah 1.28: a FROM scratch build whose
  # ADD unpacks the tarball does the same.
  local ctx=$cache/base-context
  rm -rf "$ctx"
  mkdir -p "$ctx"
  ln "$base_tar" "$ctx/rootfs.tar" 2>/dev/null || cp "$base_tar" "$ctx/rootfs.tar"
  printf 'FROM scratch\nADD rootfs.tar /\nCMD ["bash"]\n' >"$ctx/Containerfile"
  say "storing the base as $base"
  bounded 300 buildah bud --isolation chroot --quiet -f "$ctx/Containerfile" -t "$base" "$ctx" >/dev/null ||
    die "could not store the base image $base"
  rm -rf "$ctx"
}

############################################################ 2. image
binary() {
  if [ -n "${FULCRUM_BINARY:-}" ]; then
    [ -x "$FULCRUM_BINARY" ] || die "FULCRUM_BINARY=$FULCRUM_BINARY is not an executable file"
    echo "$FULCRUM_BINARY"
    return
  fi
  say "cargo build --release -p fulcrum --locked"
  (cd "$repo" && timeout -k 10 "$cargo_secs" cargo build --release -p fulcrum --locked >&2) ||
    die "cargo build --release -p fulcrum failed or took over ${cargo_secs}s (FULCRUM_CARGO_TIMEOUT)"
  echo "${CARGO_TARGET_DIR:-$repo/target}/release/fulcrum"
}

# The runtime stage of a Dockerfile: from its last FROM, without comments,
# blank lines, the FROM itself and the COPY of the binary (whose source
# differs by design).
runtime_stage() {
  awk '/^FROM /{ n = NR } { line[NR] = $0 } END { for (i = n + 1; i <= NR; i++) print line[i] }' "$1" |
    grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' -e '^COPY .*/usr/local/bin/fulcrum$'
}

stages_in_step() {
  diff <(runtime_stage "$repo/docker/Dockerfile") <(runtime_stage "$repo/docker/Dockerfile.local") >&2 ||
    die "docker/Dockerfile.local's runtime stage differs from docker/Dockerfile's (above): keep them in step"
  say "docker/Dockerfile.local matches docker/Dockerfile's runtime stage"
}

build_image() {
  local bin=$1 ctx=$cache/context old
  stages_in_step
  "$bin" --version >/dev/null || die "$bin --version failed"
  rm -rf "$ctx"
  mkdir -p "$ctx"
  cp "$bin" "$ctx/fulcrum"
  old=$(buildah inspect --type image --format '{{.FromImageID}}' "$image" 2>/dev/null || true)
  say "buildah bud docker/Dockerfile.local -> $image"
  # --format docker keeps HEALTHCHECK (OCI images have no such field);
  # --layers caches the apt-get layer, so a rebuild needs no network.
  bounded 600 buildah bud --isolation chroot --format docker --layers \
    --build-arg "BASE=$base" -f "$repo/docker/Dockerfile.local" -t "$image" "$ctx" >"$cache/bud.log" 2>&1 || {
    tail -15 "$cache/bud.log" >&2
    mirror_reachable || cannot "building the image needs the Debian mirror $mirror (apt-get update), which does not answer"
    die "buildah bud of docker/Dockerfile.local failed"
  }
  local new
  new=$(buildah inspect --type image --format '{{.FromImageID}}' "$image")
  if [ -n "$old" ] && [ "$old" != "$new" ]; then
    buildah rmi "$old" >/dev/null 2>&1 || true
  fi
  say "image $image: $new"
}

############################################################ 3. run
pg_bin=/usr/lib/postgresql/15/bin

# A loopback port nothing listens on, below Linux's ephemeral range (so no
# outgoing connection holds it) and far from 5432 and 3306; the caller's bind
# settles it.
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$((20000 + RANDOM % 12000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return
    fi
  done
  die "no free loopback port found"
}

wait_tcp() { # port seconds [pid that must stay alive meanwhile]
  local until=$((SECONDS + $2))
  while ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do
    [ "$SECONDS" -lt "$until" ] || return 1
    [ -z "${3:-}" ] || kill -0 "$3" 2>/dev/null || return 1
    sleep 0.2
  done
}

# A PostgreSQL program run as postgres (initdb refuses root), from a
# directory it may read.
as_postgres() { # seconds program args...
  (cd "$work" && bounded "$1" runuser -u postgres -- "$pg_bin/$2" "${@:3}")
}

start_postgres() {
  [ -x "$pg_bin/initdb" ] || cannot "no PostgreSQL 15 server ($pg_bin; apt-get install postgresql-15)"
  id postgres >/dev/null 2>&1 || cannot "no postgres user to run PostgreSQL as"
  pg_data=$work/pg
  mkdir -m 700 "$pg_data"
  chown postgres: "$pg_data"
  as_postgres 120 initdb -D "$pg_data" -U postgres --auth=trust \
    --no-sync --no-instructions -E UTF8 --locale=C >"$work/initdb.log" 2>&1 ||
    { cat "$work/initdb.log" >&2; die "initdb failed"; }
  printf 'local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n' >"$pg_data/pg_hba.conf"
  local try
  for try in 1 2 3; do
    pg_port=$(free_port)
    cat >>"$pg_data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $pg_port
unix_socket_directories = '$pg_data'
fsync = off
EOF
    if as_postgres 90 pg_ctl -D "$pg_data" -l "$pg_data/server.log" -w -t 60 start >/dev/null; then
      break
    fi
    grep -q 'could not bind' "$pg_data/server.log" && [ "$try" -lt 3 ] && continue
    tail -20 "$pg_data/server.log" >&2
    die "PostgreSQL did not start (log above)"
  done
  bounded 30 "$pg_bin/psql" -XqAt -h "$pg_data" -p "$pg_port" -U postgres -d postgres \
    -c "CREATE ROLE app LOGIN PASSWORD 'secret'" -c "CREATE DATABASE app OWNER app" >/dev/null ||
    die "could not create the app role and database"
  say "PostgreSQL 15 on 127.0.0.1:$pg_port ($pg_data)"
}

# The config the container sees at /etc/fulcrum/fulcrum.toml: the listener
# on 6432 when free (the image's HEALTHCHECK probes that port), else any.
write_config() {
  fulcrum_port=6432
  if (exec 3<>/dev/tcp/127.0.0.1/6432) 2>/dev/null; then fulcrum_port=$(free_port); fi
  mkdir -m 755 "$work/etc"
  cat >"$work/etc/fulcrum.toml" <<EOF
# Written by docker/build-local.sh --check.
[fulcrum]
log = "info"
shutdown_timeout = "5s"

[[cluster]]
name = "image-check"
protocol = "postgres"
listen = "127.0.0.1:$fulcrum_port"
client_auth = "scram-sha-256"

[[cluster.backend]]
address = "127.0.0.1:$pg_port"
role = "primary"

[[cluster.user]]
name = "app"
password = "secret"
EOF
  chmod 644 "$work/etc/fulcrum.toml"
}

# The strings of a list in the image's config (Entrypoint, Cmd,
# Healthcheck.Test), one a line.
image_list() {
  buildah inspect --type image --format "{{range .Docker.Config.$1}}{{printf \"%s\\n\" .}}{{end}}" "$image"
}

# A working container of the image. buildah run would give the daemon 1024
# open files (Docker's default is far more): it gets this shell's hard limit.
working_container() {
  local nofile
  nofile=$(ulimit -Hn)
  [ "$nofile" != unlimited ] || nofile=1048576
  buildah from --ulimit "nofile=$nofile:$nofile" "$image"
}

# The pid of the process named $2 among $1's descendants.
descendant() {
  local pid
  for pid in $(ps -o pid= --ppid "$1"); do
    if [ "$(ps -o comm= -p "$pid")" = "$2" ]; then echo "$pid"; return; fi
    descendant "$pid" "$2" && return
  done
  return 1
}

start_daemon() { # config file on the host
  ctr=$(working_container)
  local cmd
  # The image's entrypoint and command, as `docker run` would start them.
  mapfile -t cmd < <(image_list Entrypoint; image_list Cmd)
  [ "${cmd[0]:-}" = fulcrum ] || die "the image's entrypoint is not fulcrum: ${cmd[*]}"
  bounded 30 buildah run --isolation chroot -v "$1:/etc/fulcrum/fulcrum.toml:ro" "$ctr" -- \
    fulcrum check --config /etc/fulcrum/fulcrum.toml >&2 || die "fulcrum check in the container refused the config"
  say "starting ${cmd[*]} in $ctr"
  # In a session of its own (as below): a signal to this script's process
  # group must not reach buildah run, which would kill the daemon outright.
  setsid -w buildah run --isolation chroot -v "$1:/etc/fulcrum/fulcrum.toml:ro" "$ctr" -- "${cmd[@]}" \
    >"$work/fulcrum.log" 2>&1 &
  run_pid=$!
}

# The image's HEALTHCHECK, run in the container as Docker would, against the
# daemon (only when its listener got 6432, the port the probe knows).
healthcheck() {
  local test
  mapfile -t test < <(image_list Healthcheck.Test)
  [ "${test[0]:-}" = CMD ] || die "the image has no HEALTHCHECK CMD [...] (got: ${test[*]:-nothing})"
  if [ "$fulcrum_port" != 6432 ]; then
    say "6432 is taken on this machine: the image's HEALTHCHECK (${test[*]:1}) not tried"
    return
  fi
  bounded 15 buildah run --isolation chroot "$ctr" -- "${test[@]:1}" ||
    die "the image's HEALTHCHECK (${test[*]:1}) fails against the running daemon"
  say "the image's HEALTHCHECK (${test[*]:1}) passes"
}

check() {
  make_base
  build_image "$bin"
  work=$(mktemp -d /tmp/fulcrum-image-check.XXXXXX)
  chmod 755 "$work"
  start_postgres
  write_config
  start_daemon "$work/etc/fulcrum.toml"
  if ! wait_tcp "$fulcrum_port" 30 "$run_pid"; then
    tail -20 "$work/fulcrum.log" >&2
    kill -0 "$run_pid" 2>/dev/null || die "the containerised daemon exited before listening (its log above)"
    die "the containerised daemon is not listening on 127.0.0.1:$fulcrum_port after 30 s (its log above)"
  fi
  daemon_pid=$(descendant "$run_pid" fulcrum) || die "no fulcrum process under buildah run (pid $run_pid)"
  # It is the image's binary, chrooted into the container, as uid 10001.
  [ "$(readlink "/proc/$daemon_pid/root")" != / ] || die "the daemon (pid $daemon_pid) is not chrooted"
  [ "$(ps -o uid= -p "$daemon_pid" | tr -d ' ')" = 10001 ] || die "the daemon does not run as uid 10001 (fulcrum)"
  local answer='' until=$((SECONDS + 30))
  while [ "$SECONDS" -lt "$until" ]; do
    answer=$(bounded 15 env PGPASSWORD=secret PGCONNECT_TIMEOUT=5 "$pg_bin/psql" -XqAt -h 127.0.0.1 \
      -p "$fulcrum_port" -U app -d app -c 'SELECT 1' 2>"$work/psql.err") && break
    sleep 0.5
  done
  if [ "$answer" != 1 ]; then
    cat "$work/psql.err" >&2
    tail -20 "$work/fulcrum.log" >&2
    die "SELECT 1 through the containerised daemon answered '${answer}', not 1"
  fi
  say "psql -h 127.0.0.1 -p $fulcrum_port -c 'SELECT 1' through the container: 1"
  healthcheck
  # SIGTERM to the daemon itself, as `docker stop` sends it: it drains and
  # exits 0, and buildah run with it. (buildah run does not pass a SIGTERM
  # of its own on: it kills its command.)
  kill -TERM "$daemon_pid"
  local rc=0
  bounded 30 tail --pid="$run_pid" -f /dev/null || die "the daemon did not stop within 30 s of SIGTERM"
  wait "$run_pid" || rc=$?
  run_pid=
  [ "$rc" -eq 0 ] || { tail -20 "$work/fulcrum.log" >&2; die "the daemon exited with status $rc on SIGTERM"; }
  ! kill -0 "$daemon_pid" 2>/dev/null || die "the daemon (pid $daemon_pid) is still running after its buildah run ended"
  daemon_pid=
  say "OK: image $image built, run, answered SELECT 1, stopped cleanly"
}

############################################################ main
case $mode in
  build)
    bin=$(binary)
    deadline=$((SECONDS + total_secs))
    make_base
    build_image "$bin"
    say "done; run it with: $0 --run CONFIG (or --check for the self-test)"
    ;;
  check)
    bin=$(binary)
    deadline=$((SECONDS + total_secs))
    check
    ;;
  run)
    [ -r "$run_config" ] || die "cannot read $run_config"
    if ! buildah inspect --type image "$image" >/dev/null 2>&1; then
      bin=$(binary)
      deadline=$((SECONDS + total_secs))
      make_base
      build_image "$bin"
      deadline=$((SECONDS + 1000000)) # the daemon runs until stopped
    fi
    ctr=$(working_container)
    say "running $image in $ctr with $run_config; Ctrl-C or SIGTERM stops it (the daemon drains)"
    setsid -w buildah run --isolation chroot -v "$(realpath "$run_config"):/etc/fulcrum/fulcrum.toml:ro" \
      "$ctr" -- fulcrum --config /etc/fulcrum/fulcrum.toml &
    run_pid=$!
    until daemon_pid=$(descendant "$run_pid" fulcrum); do
      kill -0 "$run_pid" 2>/dev/null || break
      sleep 0.2
    done
    # buildah run kills its command on SIGTERM or SIGINT, so it runs in a
    # session of its own (Ctrl-C does not reach it) and the daemon is
    # signalled itself instead, as `docker stop` would: it drains.
    trap '[ -z "$daemon_pid" ] || kill -TERM "$daemon_pid" 2>/dev/null' INT TERM
    # (A wait cut short by the trap is waited again; the last is the status.)
    while kill -0 "$run_pid" 2>/dev/null; do rc=0; wait "$run_pid" || rc=$?; done
    run_pid='' daemon_pid=''
    exit "$rc"
    ;;
esac
