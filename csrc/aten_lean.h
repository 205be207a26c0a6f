// The part of ATen these ops use, in place of <ATen/ATen.h>: tensors and their methods, the
// factory functions called (at::empty, at::empty_like, at::zeros_like), the AT_DISPATCH macros
// and at::parallel_for.
// Parsing <ATen/ATen.h> (every operator's declaration) took 16.0 s of g++ a translation unit
// here, these headers with <torch/library.h> 11.6 s (<torch/library.h> alone 9.0 s).
// TORCH_ASSERT_ONLY_METHOD_OPERATORS makes a later include of <ATen/ATen.h> (or of an op this
// list lacks through it) a compile error instead of a silent slowdown: add the op's own
// <ATen/ops/NAME.h> here.
#pragma once

#ifndef TORCH_ASSERT_ONLY_METHOD_OPERATORS
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#endif

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
