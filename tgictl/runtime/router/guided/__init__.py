"""Guided generation in the router: grammars checked at validation, tools (docs/architecture.md, "Guided generation")."""
