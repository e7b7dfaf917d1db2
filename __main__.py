"""`python -m gpuscope` serves MCP over stdio, like `gpuscope serve`."""

from gpuscope.server.cli import main

if __name__ == "__main__":
    main(["serve"])
