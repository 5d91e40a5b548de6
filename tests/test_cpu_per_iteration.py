"""What a loop-agent and the eval-agent no longer redo on every run or every command, and that
the shortcuts answer exactly as the long way did: the sandbox's view (built for every verify
command) and the model client's TLS context (one client per run)."""
from __future__ import annotations

import os
import ssl
from pathlib import Path

import pytest

from roles.workbench.sandbox import view
from roles.workbench.sandbox.toolchains import Exposure, Toolchain


def _under_any_by_hand(path: str, tops) -> bool:
    return any(path == t or path.startswith(t.rstrip("/") + "/") for t in tops)


@pytest.mark.parametrize("path", ["/", "/a", "/a/", "/a/b", "/ab", "/ab/c", "/x/y", "", "a/b", "/a//b"])
@pytest.mark.parametrize("tops", [[], ["/"], ["/a"], ["/a/"], ["/ab", "/x"], [""], ["/a", "/a/b", "/x/y/"], ["a"]])
def test_tops_answer_as_under_any(path, tops):
    assert view._Tops(tops).cover(path) == _under_any_by_hand(path, tops) == view._under_any(path, tops)


def _old_denied(homes, shown):
    out = {}
    for home in dict.fromkeys(h for h in homes if h):
        for rel in view.DENY:
            path = os.path.join(home, rel)
            if os.path.lexists(path) and _under_any_by_hand(path, shown):
                out.setdefault(path, Exposure(path, "deny-list: keys, credentials or history"))
    return list(out.values())


def test_denied_finds_what_a_lookup_of_every_entry_finds(tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".config" / "gcloud").mkdir(parents=True)
    (home / ".config" / "gh").write_text("token")
    (home / ".netrc").write_text("machine x")
    os.symlink("/nonexistent", home / ".aws")                  # a dangling link is still there
    (home / ".cargo").mkdir()
    (home / ".cargo" / "credentials.toml").write_text("")
    os.symlink(home, tmp_path / "link")                        # a home reached through a link
    (tmp_path / "file").write_text("not a folder")
    other = tmp_path / "other"
    other.mkdir()
    homes = [str(home), str(tmp_path / "link"), str(tmp_path / "file"), str(tmp_path / "absent"), str(other), ""]
    for shown in ([str(tmp_path)], [str(home)], [str(home / ".config")], [str(other)], [], ["/"]):
        assert view._denied(homes, shown) == _old_denied(homes, shown)
    assert {e.path for e in view._denied(homes, [str(tmp_path)])} >= {
        str(home / ".ssh"), str(home / ".aws"), str(home / ".config/gcloud"), str(home / ".config/gh"),
        str(home / ".netrc"), str(home / ".cargo/credentials.toml")}


def test_view_hides_a_home_deny_list_and_org_homes(tmp_path):
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_ed25519").write_text("key")
    org = home / "org"
    org.mkdir()
    got = view.build(Toolchain(f"{home}/bin:/usr/bin", str(home)), own_home=org,
                     readonly=[Exposure(str(home), "org.toml")])
    hidden = {e.path for e in got.hidden}
    assert str(home / ".ssh") in hidden and os.path.realpath(org) in hidden
    assert str(home) in {e.path for e in got.readonly}


def test_one_tls_context_per_process_still_verifying(monkeypatch):
    pytest.importorskip("anthropic")
    from roles.loop_agent.backends import anthropic_backend as ab
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    first = ab._tls_context()
    assert ab._tls_context() is first
    assert first.verify_mode == ssl.CERT_REQUIRED and first.check_hostname
    one = ab._http_client("https://api.example.invalid", 5.0)
    two = ab._http_client("https://api.example.invalid", 5.0)
    try:
        assert one is not two
        assert one.timeout.read == 5.0 and one.follow_redirects
    finally:
        one.close()
        two.close()


def test_tls_context_follows_ssl_cert_file(monkeypatch, tmp_path):
    pytest.importorskip("anthropic")
    from roles.loop_agent.backends import anthropic_backend as ab
    bundle = Path(ssl.get_default_verify_paths().openssl_cafile or "")
    if not bundle.is_file():
        pytest.skip("no system CA bundle")
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    plain = ab._tls_context()
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    assert ab._tls_context() is not plain          # another CA store: another context
