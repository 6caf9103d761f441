"""The execution protocol (DESIGN.md, steps 3-7): one attempt of an intent against its
provider under a lease and fencing token, the call it sends, the errors it classifies and the
wait between tries."""
