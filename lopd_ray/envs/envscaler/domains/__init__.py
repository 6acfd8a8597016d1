"""One module per generated environment. Each defines a ToolEnvironment subclass (its @tool methods are the
tools) and `DOMAIN = Domain(...)` with its task kinds; suite.DOMAIN_MODULES is the registry."""
