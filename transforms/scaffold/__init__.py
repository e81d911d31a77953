"""The scaffold (countdown tokens, llm.c shards) job's own steps: encoding and the llm.c writer."""
