"""Free-text generation on the embedded default model (SmolLM2-135M-Instruct)."""

from pocket_agent import generate

result = generate("What is the capital of France?", system="You are a helpful assistant.", max_tokens=64)
print(result.text)
print(f"[{result.finish_reason}] {result.usage.completion_tokens} tokens")
