"""Multi-LoRA on the shard: PEFT adapters read and checked at start-up, their factors stacked per
layer and applied per row beside the base linears (docs/architecture.md, "Multi-LoRA")."""
