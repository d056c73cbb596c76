// Empty on purpose: qgrad_layer_check_<layer> links one layer's archive
// whole, with only the libraries that layer may use, into a shared object
// with --no-undefined, so a call against the layer order fails to link.
