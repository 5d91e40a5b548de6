# Sourced by scripts/start-org and scripts/test: make .venv and install the project once (and, for
# scripts/test, the pinned Claude Code CLI; see ensure_claude_code below).
# A stamp file holding a hash of pyproject.toml (and of the install mode) says the install is current, so later starts
# skip pip entirely (a pip no-op costs ~0.5 s). Only ensure_postgresql and ensure_sshd (scripts/test)
# run a system package manager, and only as root (or with password-less sudo) when the server is
# missing and ORG_TEST_NO_SYSTEM_PACKAGES is not set (system_install).
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

# The checkout goes on the virtual environment's sys.path through a plain .pth line ("compat"),
# not setuptools' default import hook: that hook is imported at the start of every Python process
# (~15-20 ms each: the supervisor, the role template, every CLI call).
editable_mode="compat"

install_stamp() {  # what a current install's stamp holds: pyproject.toml and how it is installed
  { cat "$root/pyproject.toml"; echo "$editable_mode"; } | sha256sum | cut -c1-16
}

install_current() {  # $1: extras ("" or "test"); true when .venv holds a current install of them
  local extras="$1" want
  want="$(install_stamp)"
  [ -x "$venv/bin/python" ] || return 1
  [ "$(cat "$venv/.installed${extras:+-$extras}" 2>/dev/null)" = "$want" ] && return 0
  # an install with the test extras (scripts/test) holds the plain one
  [ -z "$extras" ] && [ "$(cat "$venv/.installed-test" 2>/dev/null)" = "$want" ]
}

ensure_installed() {  # $1: extras ("" or "test")
  local extras="$1" stamp
  stamp="$venv/.installed${extras:+-$extras}"
  install_current "$extras" && return 0
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
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check \
      --config-settings editable_mode="$editable_mode" -e "$root$([ -n "$extras" ] && echo "[$extras]")" >&2; then
    echo "error[install_failed]: pip could not install loop-org — see the messages above" >&2
    exit 1
  fi
  install_stamp > "$stamp"
}

# The project's own bytecode. Python writes the bytecode of what it imports itself, unless
# PYTHONDONTWRITEBYTECODE is set (as in many containers): then every org process would compile
# the org's code again when it starts (~0.2 s of CPU each). So there it is written here, for what
# changed since the last time (compileall compares each file's mtime and size; ~0.1 s otherwise).
ensure_bytecode() {
  [ -n "${PYTHONDONTWRITEBYTECODE:-}" ] || return 0
  "$venv/bin/python" -m compileall -q -j 0 "$root/roles" "$root/state_db" "$root/transport" \
    "$root/scripts" "$root/knowledge" "$root/skills" "$root/bench" >/dev/null 2>&1 || true
}

# The real Claude Code CLI for tests/test_claude_code_real.py, pinned to one exact version and
# cached in the checkout (visible read-only inside the sandbox, where the real home is hidden).
# 2.1.112 is the last release whose npm package is plain JavaScript (cli.js, Node >= 18); later
# ones ship a native binary per platform. Optional dependencies (image codecs) are left out.
claude_code_version="2.1.112"
claude_code_dir="$root/.cache/claude-code/$claude_code_version"

ensure_claude_code() {  # installs once; a failure fails the run under CI=true, else one warning line
  local stamp="$claude_code_dir/.installed" log="$claude_code_dir.install.log" tmp problem=""
  [ -f "$stamp" ] && [ -x "$claude_code_dir/node_modules/.bin/claude" ] && return 0
  if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
    problem="node and npm are not installed"
  elif ! node -e 'process.exit(parseInt(process.versions.node, 10) < 18 ? 1 : 0)' 2>/dev/null; then
    problem="node $(node --version) is older than 18"
  else
    echo "loop-org: installing @anthropic-ai/claude-code@$claude_code_version into $claude_code_dir (once)" >&2
    mkdir -p "$(dirname "$claude_code_dir")"
    tmp="$(mktemp -d "$claude_code_dir.tmp-XXXXXX")" && chmod 755 "$tmp"
    if npm install --prefix "$tmp" --no-save --no-audit --no-fund --ignore-scripts --omit=optional \
         --loglevel=error "@anthropic-ai/claude-code@$claude_code_version" >"$log" 2>&1 \
       && [ "$(HOME="$tmp" "$tmp/node_modules/.bin/claude" --version 2>>"$log" | cut -d' ' -f1)" = "$claude_code_version" ]; then
      rm -rf "$claude_code_dir" "$log"
      mv "$tmp" "$claude_code_dir"
      date -u +%FT%TZ > "$stamp"
      return 0
    fi
    rm -rf "$tmp"
    problem="npm could not install @anthropic-ai/claude-code@$claude_code_version (see $log)"
  fi
  if [ "${CI:-}" = "true" ]; then
    [ -f "$log" ] && cat "$log" >&2
    echo "error[claude_code_install_failed]: $problem — the real-CLI test needs it under CI=true" >&2
    exit 1
  fi
  echo "warning[claude_code_missing]: $problem; the real Claude Code test will be skipped" >&2
}

# A Debian package the tests need (scripts/test only), installed with apt-get as root (or with
# password-less sudo): $1 the package, $2 what it is for. ORG_TEST_NO_SYSTEM_PACKAGES=1 skips every
# such install; without it, root or apt-get, one warning line says what is skipped and why.
system_install() {
  local package="$1" what="$2" sudo=""
  if [ -n "${ORG_TEST_NO_SYSTEM_PACKAGES:-}" ] && [ "$ORG_TEST_NO_SYSTEM_PACKAGES" != "0" ]; then
    echo "warning: $package is not installed and ORG_TEST_NO_SYSTEM_PACKAGES is set; $what will be skipped" >&2
    return 0
  fi
  [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
  if command -v apt-get >/dev/null 2>&1 && { [ -z "$sudo" ] || sudo -n true 2>/dev/null; }; then
    echo "loop-org: installing Debian's $package package (once) for $what (ORG_TEST_NO_SYSTEM_PACKAGES=1 skips this)" >&2
    if $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null 2>&1 \
       || { $sudo apt-get update -qq >/dev/null 2>&1 \
            && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null 2>&1; }; then
      return 0
    fi
  fi
  echo "warning: $package is not installed and could not be (apt-get install $package as root); $what will be skipped" >&2
}

# The PostgreSQL server the store's tests start under their temporary folder (tests/support/pg.py):
# Debian's postgresql package when no /usr/lib/postgresql/*/bin/pg_ctl exists.
ensure_postgresql() {
  compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null && return 0
  system_install postgresql "the PostgreSQL store's tests"
}

# The OpenSSH server tests/test_git_shell.py starts under its temporary folder (histories over
# ssh:// through 'org git-shell'): Debian's openssh-server package when /usr/sbin/sshd is missing.
ensure_sshd() {
  [ -x /usr/sbin/sshd ] && return 0
  system_install openssh-server "the ssh history tests"
}

# The sandbox's stages as one small compiled program (roles/workbench/sandbox/stage.c; the shell
# stages serve without it): a C compiler and the C library's headers, then the program, built once.
ensure_sandbox_stage() {
  if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
    system_install gcc "the sandbox's compiled stages"
  fi
  if [ ! -f /usr/include/stdio.h ]; then
    system_install libc6-dev "the sandbox's compiled stages"
  fi
  (cd "$root" && "$venv/bin/python" -c "from roles.workbench.sandbox import stage; stage.ensure()") >/dev/null 2>&1 || true
}
