"""Validate settings.json: durations are whole numbers of seconds."""
import json
import sys

print("validate_config: reading settings.json")
with open("settings.json", encoding="utf-8") as f:
    settings = json.load(f)
value = settings.get("timeout")
if not isinstance(value, int) or isinstance(value, bool):
    print(f'expected int for "timeout", got {type(value).__name__} {value!r}')
    print('SettingsError: "timeout" must be an integer number of seconds')
    sys.exit(1)
print("ok: every duration is a whole number of seconds")
