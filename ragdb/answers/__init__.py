"""The "G" of RAG: grounded prompts and refusal thresholds, the chat client and ``ask``,
and evaluation and calibration."""
