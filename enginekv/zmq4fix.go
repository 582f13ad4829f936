package enginekv

import (
	"io"
	"reflect"
	"unsafe"

	"github.com/go-zeromq/zmq4"
)

// closePubWriter works around a goroutine leak in zmq4 v0.17.0: a PUB
// socket's writer (pubMWriter) runs a goroutine that only its own Close
// stops, and the socket's Close never calls it, so every PUB socket leaves
// one goroutine waiting on a condition variable forever. This reaches the
// unexported writer and closes it after the socket is closed. If a later
// zmq4 renames the fields, it does nothing (and goleak in the tests says
// so).
func closePubWriter(s zmq4.Socket) {
	v := reflect.ValueOf(s)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return
	}
	sck := v.Elem().FieldByName("sck")
	if !sck.IsValid() || sck.Kind() != reflect.Pointer || sck.IsNil() {
		return
	}
	w := sck.Elem().FieldByName("w")
	if !w.IsValid() || w.Kind() != reflect.Interface || w.IsNil() {
		return
	}
	w = reflect.NewAt(w.Type(), unsafe.Pointer(w.UnsafeAddr())).Elem()
	if c, ok := w.Interface().(io.Closer); ok {
		_ = c.Close()
	}
}
