"""What of a run survives it: training-state checkpoints (orbax) to resume from, and the trained
policy exported as a Hugging Face directory."""
