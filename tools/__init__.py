"""TrainingCXL tools: generators and the command line."""
