"""The bucketed (FinePDFs-Edu) job's own steps: language filter, removal lists, tokenizer, shard writer."""
