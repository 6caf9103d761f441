"""Who may reach what: an agent's scopes and a user's role on a tenant."""
