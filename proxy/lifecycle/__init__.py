"""The stored data's lifecycle: deleting a session or a tenant's everything, retention, what the store holds."""
