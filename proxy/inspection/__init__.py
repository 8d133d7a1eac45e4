"""What the inspection routes and the CLI show of the store (sessions, history, spans, journal) and the pin
writes they make."""
