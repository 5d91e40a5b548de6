# Sourced by scripts/start-org and scripts/test: make .venv and install the project once.
# A stamp file holding a hash of pyproject.toml says the install is current, so later starts
# skip pip entirely (a pip no-op costs ~0.5 s). Never runs a system package manager.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"

find_python() {
  for py in "${PYTHON:-}" python3.13 python3.12 python3.11 python3; do
    [ -n "$py" ] || continue
    if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$py"; return 0
    fi
  done
  return 1
}

ensure_installed() {  # $1: extras ("" or "test")
  local extras="$1" spec="." stamp want
  [ -n "$extras" ] && spec=".[$extras]"
  stamp="$venv/.installed${extras:+-$extras}"
  want="$(cat "$root/pyproject.toml" | sha256sum | cut -c1-16)"
  if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  if [ "$(uname -s)" != "Linux" ]; then
    echo "error[unsupported_platform]: loop-org runs on Linux only — use a Linux machine or VM" >&2
    exit 1
  fi
  local py
  if ! py="$(find_python)"; then
    echo "error[python_missing]: loop-org needs Python 3.11 or newer — install it, or set PYTHON=/path/to/python3.11" >&2
    exit 1
  fi
  if [ ! -x "$venv/bin/python" ]; then
    echo "loop-org: creating $venv with $py" >&2
    "$py" -m venv "$venv" || { echo "error[venv_failed]: could not create $venv — is the python3-venv package installed?" >&2; exit 1; }
  fi
  echo "loop-org: installing the project${extras:+ with [$extras]} (once)" >&2
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check -e "$root$([ -n "$extras" ] && echo "[$extras]")" >&2; then
    echo "error[install_failed]: pip could not install loop-org — see the messages above" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
}
