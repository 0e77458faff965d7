// rl/sdk/sdk.hpp: everything a plugin author needs.
#pragma once
#include "error.hpp"
#include "params.hpp"
#include "plugin.hpp"
#include "tensor.hpp"
