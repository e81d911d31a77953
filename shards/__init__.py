"""On-disk formats of beam-pretokenize and the code that reads them. No Beam import here."""
