"""``manage.py bench``: end-to-end, baseline, database-cost, console and reconciler benchmarks.

Every phase runs against a scratch database (``effect_ledger_bench``) created on the server
``DATABASE_URL`` names and dropped at the end, so the user's data is never touched.
"""
