"""What the RNN Encoder-Decoder (rescorer) and the CSLM (cslm) share: devices and
precision, CUDA graphs, vocabularies, config records, the model-file envelope."""
