# Sourced by the throwaway-*.sh scripts: messages, Debian packages, and a free port.
say() { echo "$(basename "$0" .sh): $*" >&2; }

# Installs Debian packages, through sudo unless this is root.
apt_install() {
  local sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "$@" >&2
}

# A port on 127.0.0.1 that nothing answers on.
free_port() {
  local candidate
  for _ in $(seq 1 50); do
    candidate=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then echo "$candidate"; return; fi
  done
  say "found no free port"; return 1
}
