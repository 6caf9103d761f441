"""The rules per action: risk tier, approval rule, retries, ceilings, and whether an approval
may still be used."""
