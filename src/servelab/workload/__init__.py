"""What is sent: seeded synthetic prompts, shared prefixes and conversations (synthetic),
prompts from a pinned dataset (datasets), and the prompt set of a launch, tokenized and checked
against the server (promptset)."""
