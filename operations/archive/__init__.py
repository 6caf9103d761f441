"""Retention and archive (issue 36; DESIGN.md, "Retention"): settled intents leave the live
tables for append-only, signed archive files, without losing what they prove.

- ``records``: what one archived intent is (its row, its audit chain, every row about it, the
  API's answer), read from the database in bulk;
- ``files``: where segment files live and how they are written (``.partial``, fsync, rename);
- ``manifests``: the signed statement of a segment and its inclusion proofs;
- ``services``: ``archive_run`` (write, then delete in small batches; resumable);
- ``selectors``: where an archived intent is, and reading it back from its file;
- ``verification``: ``archive_verify``, every file and manifest against its signed statement,
  the index and the checkpoints (``manage.py verify_audit``).
"""
