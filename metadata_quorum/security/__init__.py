"""Security: principals, ACLs and the authorizer, SCRAM credentials (pure), and the IO edges that
carry them (TLS contexts, gRPC authentication). See docs/security.md."""
