"""tgictl: serve large language models the way text-generation-inference v3 does."""

__version__ = "0.1.0"
