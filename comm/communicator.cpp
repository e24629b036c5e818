#include "comm/communicator.hpp"

namespace ringattn::comm {

size_t data_type_size(DataType t) {
  switch (t) {
    case DataType::u8: return 1;
    case DataType::i32: return 4;
    case DataType::i64: return 8;
    case DataType::f32: return 4;
    case DataType::f64: return 8;
  }
  return 0;
}

}  // namespace ringattn::comm
