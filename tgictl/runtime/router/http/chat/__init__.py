"""One chat turn, whatever API asked for it: the conversation as the chat template sees it, the prompt and
grammar it renders to, and the answer read back as reasoning, text and tool calls (docs/architecture.md,
"APIs"). OpenAI's chat completions, Anthropic's Messages and OpenAI's Responses each translate their body
into a ChatTurn and the answer's pieces into their own shapes; the scheduler never learns which API asked."""
