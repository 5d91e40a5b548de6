"""``org config check|show|schema``: validate org.toml, print the effective configuration, or print
org.toml's JSON Schema (generated from the typed models in state_db/kernel/config.py) for editors."""
from __future__ import annotations

from scripts.cli.output import add_json, emit_json, home_of
from state_db.kernel import config as config_mod

NAME = "config"
HELP = "check org.toml against its schema, show the effective configuration, or print its JSON Schema"


def add_arguments(p) -> None:
    p.add_argument("action", choices=["check", "show", "schema"],
                   help="check: validate; show: print effective values; schema: print org.toml's JSON Schema")
    add_json(p)


def run(args) -> int:
    if args.action == "schema":          # needs no org: editors point at the printed file
        emit_json(config_mod.json_schema())
        return 0
    home = home_of(args)
    path = home.config_path
    cfg = config_mod.load(path if path.exists() else None)
    if args.action == "check":
        if args.json:
            emit_json({"ok": True, "path": str(path), "exists": path.exists(), "overridden": cfg.overridden})
        else:
            where = str(path) if path.exists() else f"{path} (absent: defaults apply)"
            print(f"ok: {where}")
            for key, var in cfg.overridden.items():
                print(f"  {key} overridden by ${var}")
        return 0
    data = _shown(cfg.data)
    if args.json:
        emit_json({"path": str(path), "config": data, "overridden": cfg.overridden})
        return 0
    for section, values in data.items():
        if section == "prices":
            for model, p in values.items():
                print(f"prices.{model}: " + ", ".join(f"{k}={v}" for k, v in p.items()))
            continue
        for key, value in values.items():
            note = f"   (from ${cfg.overridden[f'{section}.{key}']})" if f"{section}.{key}" in cfg.overridden else ""
            print(f"{section}.{key} = {value!r}{note}")
    return 0


def _shown(data: dict) -> dict:
    """The configuration as printed: a password in the store's URL is never shown."""
    from state_db.store import describe
    url = (data.get("state") or {}).get("url")
    return {**data, "state": {**data["state"], "url": describe(url)}} if url else data
