/* cuemu stand-in for the CUDA header of this name (WMMA is in cuemu.h) */
#include "cuemu.h"
