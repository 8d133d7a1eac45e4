"""The proxy's configuration: the keys (`schema`) and how a file's sections are read (`sections`)."""
