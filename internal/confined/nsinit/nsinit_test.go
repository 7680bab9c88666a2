package nsinit

import (
	"reflect"
	"testing"
)

// Every field of the root's layout comes from the Config field of the
// same name, so that one the host sets cannot be dropped on the way.
func TestLayoutCarriesEveryField(t *testing.T) {
	cfg := &Config{}
	cv := reflect.ValueOf(cfg).Elem()
	fill := func(v reflect.Value) {
		switch v.Kind() {
		case reflect.String:
			v.SetString("x")
		case reflect.Bool:
			v.SetBool(true)
		case reflect.Int64:
			v.SetInt(7)
		case reflect.Uint32:
			v.SetUint(7)
		case reflect.Slice:
			if v.Type() == reflect.TypeOf([]string{}) {
				v.Set(reflect.ValueOf([]string{"/usr"}))
			}
		}
	}
	cfg.Files = []File{{Path: "etc/passwd", Mode: 0o644, UID: 1, GID: 2, Data: "d", Link: "l"}}
	lt := reflect.TypeOf(layout(cfg))
	for i := range lt.NumField() {
		f := cv.FieldByName(lt.Field(i).Name)
		if !f.IsValid() {
			t.Fatalf("Config has no field %s", lt.Field(i).Name)
		}
		fill(f)
	}
	l := reflect.ValueOf(layout(cfg))
	for i := range lt.NumField() {
		name := lt.Field(i).Name
		if name == "Files" {
			continue
		}
		if got, want := l.Field(i).Interface(), cv.FieldByName(name).Interface(); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
	got := l.FieldByName("Files").Index(0)
	want := reflect.ValueOf(cfg.Files[0])
	for i := range want.NumField() {
		name := want.Type().Field(i).Name
		if g := got.FieldByName(name); !g.IsValid() || !reflect.DeepEqual(g.Interface(), want.Field(i).Interface()) {
			t.Errorf("Files[0].%s: %v, want %v", name, g, want.Field(i))
		}
	}
}
