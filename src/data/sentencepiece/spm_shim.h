// The C interface of the SentencePiece shim (spm_shim.cc), a module that dtrain_data loads with
// dlmopen(LM_ID_NEWLM) so that libsentencepiece's bundled protobuf never meets the system
// libprotobuf of gRPC in one namespace (docs/text-data.md, "Linking"). Every call but the two
// frees and dtrain_spm_piece_size returns a result (null only when out of memory) to be read with
// dtrain_spm_result_* and released with dtrain_spm_result_free; a result's error is null on
// success. Processors and results belong to the shim and are freed only by it. Private to
// src/data.
#pragma once

#include <cstddef>

extern "C" {

// A processor from a serialized ModelProto (the .model file's bytes):
// dtrain_spm_result_take_processor hands it over.
__attribute__((visibility("default"))) void* dtrain_spm_load(const char* proto, size_t size);
// Trains on `corpus` (its lines, empty ones skipped). `args`: the trainer's flags as
// NUL-terminated key and value strings one after another; `seed`: SentencePiece's random seed.
// The result's bytes are the model's serialized ModelProto.
__attribute__((visibility("default"))) void* dtrain_spm_train(const char* corpus,
                                                              size_t corpus_size, const char* args,
                                                              size_t args_size, unsigned seed);
// The result's ids.
__attribute__((visibility("default"))) void* dtrain_spm_encode(const void* processor,
                                                               const char* text, size_t size);
// The result's bytes.
__attribute__((visibility("default"))) void* dtrain_spm_decode(const void* processor,
                                                               const int* ids, size_t n);
__attribute__((visibility("default"))) int dtrain_spm_piece_size(const void* processor);
__attribute__((visibility("default"))) void dtrain_spm_processor_free(void* processor);

__attribute__((visibility("default"))) const char* dtrain_spm_result_error(const void* result);
__attribute__((visibility("default"))) const char* dtrain_spm_result_bytes(const void* result,
                                                                           size_t* size);
__attribute__((visibility("default"))) const int* dtrain_spm_result_ids(const void* result,
                                                                        size_t* n);
__attribute__((visibility("default"))) void* dtrain_spm_result_take_processor(void* result);
__attribute__((visibility("default"))) void dtrain_spm_result_free(void* result);

}  // extern "C"
