"""Provider adapters: the protocol (``base``), the registry, and one module per provider."""
