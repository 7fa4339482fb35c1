"""Language models behind one protocol: local GGUF (llama.cpp), OpenAI-compatible endpoints, and a
scripted fake for tests."""
