"""The worlds a benchmark runs on: vision (the mini-world), text (MiniLM), ..."""
