"""The version of every `--json` document's shape: its ``"schema"`` field. Raise it when a document changes
incompatibly (a field removed or its meaning changed); adding a field does not."""

JSON_SCHEMA = 1
