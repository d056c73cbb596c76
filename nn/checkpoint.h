// Checkpoints in the safetensors format (readable by Python's
// `safetensors`): an 8-byte little-endian header length, a JSON header
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}} padded with spaces to 8 bytes, then the
// raw little-endian data. Dtypes: F32 F64 F16 BF16 I8 U8 I32 I64 BOOL, and
// F8_E4M3 / F8_E5M2 for f8e4m3 / f8e5m2.
//
// Packed int4 (s4 / u4) has no safetensors dtype: it is saved as U8 bytes
// (shape [..., D/2] for an even last dim D, else the flat [ceil(n/2)]) and
// the metadata records, per tensor <name>:
//   "<name>.dtype"   = "s4" | "u4",
//   "<name>.shape"   = the element shape as a JSON array, e.g. "[4096, 4096]",
//   "<name>.packing" = "int4x2-low-first" (element 2k in the low nibble of
//                      byte k, ONNX's INT4 order).
// The group size of quantized weights is the caller's to record (by
// convention "<name>.group_size" in `metadata`). Loading turns such a U8
// tensor back into s4 / u4 of the recorded shape (checking its byte count);
// the keys stay in the returned metadata.
//
// Saving is atomic: the file is written to a temporary file in the target's
// directory, fsynced, renamed over the target and the directory fsynced, so
// a crash leaves either the old or the new checkpoint, never a torn one.
// The temporary file is named .<target>.tmp.<pid>.XXXXXX; one left by a
// killed process is removed by the next save to the same target (only
// when that process no longer exists). tests/test_faults.cpp checks this
// with hundreds of SIGKILLs.
// Training checkpoints for resume (save_train_state below) use the same
// writer, so they are atomic too; docs/design.md "Checkpoints and resume".
// Loading validates everything (header length, JSON, dtypes, shapes,
// offsets in range, contiguous, non-overlapping and covering the data,
// byte sizes, overflow) and throws a qgrad::Error naming the file.
#pragma once

#include <map>
#include <string>

#include "qgrad/nn/module.h"
#include "qgrad/nn/optim.h"

namespace qgrad::nn {

using Metadata = std::map<std::string, std::string>;

struct SafetensorsFile {
  NamedTensors tensors;  // host tensors, in data order
  Metadata metadata;
};

// Tensors on any device (copied to the host). Names must be unique,
// non-empty and not "__metadata__".
void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {});
SafetensorsFile load_safetensors(const std::string& path);
// The same parser on a file's bytes already in memory; `name` stands for the
// file in error messages. load_safetensors calls it; the fuzzer
// (fuzz/fuzz_safetensors.cpp) feeds it directly.
SafetensorsFile parse_safetensors(const char* bytes, std::size_t size, const std::string& name);

// Model state ("model.<name>": parameters and buffers) and optionally the
// optimizer's ("optim.<name>"), with metadata "format" = "qgrad-checkpoint"
// and "optimizer" = its kind, plus `metadata`.
void save_checkpoint(const std::string& path, const Module& model, const Optimizer* optimizer = nullptr,
                     const Metadata& metadata = {});
// Loads into `model` (strict: names, shapes and dtypes must match) and, if
// given, `optimizer`. Returns the file's metadata.
Metadata load_checkpoint(const std::string& path, Module& model, Optimizer* optimizer = nullptr);

// ---- training state: resuming a run bit for bit ----

// A generator's whole state (seed, offset) as a host s64 [2] tensor (the
// u64 bits reinterpreted), and back; set_generator_state validates the
// tensor before changing gen.
Tensor generator_state(const Generator& gen);
void set_generator_state(Generator& gen, const Tensor& state);

using NamedGenerators = std::vector<std::pair<std::string, Generator*>>;

// One safetensors file holding everything a resumed run depends on:
//   "model.<name>"  model.state_dict(): parameters and buffers (observer
//                   min/max, fake-quant scale and zero point)
//   "quant.<name>"  quant_flags(model): the fake quants' observer and
//                   fake-quant enabled flags
//   "optim.<name>"  optimizer->state_dict(): step counts and momentum /
//                   Adam buffers (an LRSchedule is a function of the step
//                   count, so this also restores the schedule's position)
//   "rng.<name>"    generator_state of each named generator
//   "extra.<name>"  the caller's tensors (a DataLoader's state_dict, running
//                   sums of the epoch's metrics, ...)
// and metadata "format" = "qgrad-train-state", "optimizer" = its kind (or
// "none") and "state" = the caller's JSON text (phase, epoch, metrics so
// far, hyper-parameters to check on resume). Written by save_safetensors:
// atomically (temporary file in the same folder, fsync, rename, directory
// fsync), so the previous file stays valid until the new one is complete.
void save_train_state(const std::string& path, const Module& model, const Optimizer* optimizer,
                      const NamedGenerators& generators, const NamedTensors& extra, const std::string& state_json);

// Resuming is two steps, because the caller usually rebuilds its model (for
// example prepare_qat) and optimizer from the JSON before loading into them.
struct TrainStateFile {
  std::string path;
  std::string state_json;  // the caller's "state" metadata
  SafetensorsFile file;
};
// Reads and validates the file (safetensors, format, tensor name groups).
TrainStateFile read_train_state(const std::string& path);
// Loads model, quant flags, optimizer (nullptr: the file must hold none)
// and generators (each name must be in the file; the file may hold no
// other) and returns the "extra." tensors, names without the prefix. On an
// error nothing is changed: the model's and optimizer's states are
// validated by their loads and the model is restored if a later part fails.
NamedTensors restore_train_state(const TrainStateFile& state, Module& model, Optimizer* optimizer,
                                 const NamedGenerators& generators);

}  // namespace qgrad::nn
