#include "lab/scales.h"

#include <cassert>
#include <cmath>

namespace sdpa::lab {

const char* scale_name(Scale scale) {
  switch (scale) {
    case Scale::one:
      return "1";
    case Scale::inv_sqrt_d:
      return "1/sqrt(d)";
    case Scale::inv_d:
      return "1/d";
    case Scale::qk_norm:
      return "qk-norm";
    case Scale::softcap:
      return "softcap";
  }
  return "?";
}

double scale_value(Scale scale, int d) {
  assert(d >= 1);
  switch (scale) {
    case Scale::one:
      return 1.0;
    case Scale::inv_sqrt_d:
    case Scale::qk_norm:
    case Scale::softcap:
      return 1.0 / std::sqrt(static_cast<double>(d));
    case Scale::inv_d:
      return 1.0 / d;
  }
  return 1.0;
}

std::string scale_title(const std::string& name) {
  if (name == scale_name(Scale::one)) return "scale 1";
  if (name == scale_name(Scale::inv_sqrt_d)) return "1/√d";
  return name;
}

}  // namespace sdpa::lab
